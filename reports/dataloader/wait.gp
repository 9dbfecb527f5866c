set terminal png size 800,440
set output 'wait.png'
set termoption noenhanced
set title 'Accelerator idle waiting for data, per rung (modeled accelerator)'
set style data histograms
set style fill solid 0.8 border -1
set boxwidth 0.7
set ylabel '% of step time'
set yrange [0:100]
set xtics rotate by -30
set grid y
plot 'wait.dat' using 2:xtic(1) notitle
