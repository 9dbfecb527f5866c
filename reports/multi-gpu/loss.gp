# vramlab report: gnuplot loss.gp in this folder re-renders loss.png
if (!exists("vl_png")) vl_png = 'loss.png'
set terminal png size 900,480 noenhanced
set output vl_png
set title 'Training loss per step (first repetition; the mean over ranks of each rank''s shard)'
set xlabel 'step (warm-up included)'
set ylabel 'loss'
set grid
set key right top
plot 'loss.dat' index 0 using 1:2 with lines lw 2 title 'single', 'loss.dat' index 1 using 1:2 with lines lw 2 title 'dp', 'loss.dat' index 2 using 1:2 with lines lw 2 title 'ddp', 'loss.dat' index 3 using 1:2 with lines lw 2 title 'ddp-tuned', 'loss.dat' index 4 using 1:2 with lines lw 2 title 'zero1'
